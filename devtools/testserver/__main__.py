"""``python -m devtools.testserver start|stop|status``: one background dev server, recorded by PID.

``start`` prints ``BUCKETQ_MONGODB_URI=<uri>`` as its last line (also when one is already running).
"""

from __future__ import annotations

import argparse
import json
import os

from bucketq.shell.compatibility import tested_range
from devtools.jars import CACHE
from devtools.testserver import TestServer, _wait_gone

STATE = CACHE / "devserver.json"


def _running() -> dict | None:
    if not STATE.exists():
        return None
    state = json.loads(STATE.read_text())
    try:
        os.kill(state["pid"], 0)
    except ProcessLookupError:
        STATE.unlink()
        return None
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["start", "stop", "status"])
    args = parser.parse_args()
    state = _running()
    if args.action == "start":
        if state is None:
            server = TestServer(outlive_parent=True).start()
            state = {"pid": server.pid, "uri": server.uri}
            STATE.write_text(json.dumps(state))
            print(f"started test server, pid {server.pid}")
        print(f"it reports MongoDB 4.4 (wire version 9): every pymongo that bucketq allows talks to it "
              f"(tested with {tested_range()})")
        print(f"BUCKETQ_MONGODB_URI={state['uri']}")
    elif args.action == "stop":
        if state is None:
            print("no dev server running")
            return
        os.kill(state["pid"], 15)
        _wait_gone(state["pid"])
        STATE.unlink()
        print(f"stopped test server, pid {state['pid']}")
    else:
        print(f"running: pid {state['pid']}, BUCKETQ_MONGODB_URI={state['uri']}" if state else "not running")


if __name__ == "__main__":
    main()
