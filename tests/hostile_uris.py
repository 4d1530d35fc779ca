"""The hostile URIs of tests/test_secrets.py and tests/spark/test_secrets_spark.py: reserved characters in the
user name and password, srv, several hosts, options, unparseable strings; and the check that none of their
credentials shows. Fixtures ``closed_port`` and ``everything_logged`` are in tests/conftest.py."""

from __future__ import annotations

import pytest

SECRETS = ("alice9", "S3cr", "pw9")  # the pieces of every hostile URI's user name and password

# (case, URI: {port} is a closed loopback port, what the error says)
HOSTILE = [
    ("slash-in-password", "mongodb://alice9:S3cr/pw9@127.0.0.1:{port}/shop", "an '@' follows the hosts"),
    ("question-mark-in-password", "mongodb://alice9:S3cr?pw9@127.0.0.1:{port}/shop", "an '@' follows the hosts"),
    ("option-in-password", "mongodb://alice9:S3cr?w=pw9@127.0.0.1:{port}/shop", "an '@' follows the hosts"),
    ("srv", "mongodb+srv://alice9:S3cr/pw9@cluster.example.invalid/shop", "an '@' follows the hosts"),
    ("several-hosts", "mongodb://alice9:S3cr/pw9@h1:1,h2:2/shop", "an '@' follows the hosts"),
    ("port-like-password", "mongodb://alice9:1234/pw9S3cr@127.0.0.1:{port}", "an '@' follows the hosts"),
    ("at-in-password", "mongodb://alice9:S3cr@pw9@127.0.0.1:{port}/shop", "holds a reserved character"),
    ("colon-hash-brackets", "mongodb://alice9:S3cr:#[pw9]@127.0.0.1:{port}/shop", "holds a reserved character"),
    ("slash-in-user", "mongodb://al/ice9:S3crpw9@127.0.0.1:{port}/shop", "an '@' follows the hosts"),
    ("unknown-option", "mongodb://alice9:S3crpw9@127.0.0.1:{port}/shop?bogusOption=1", "/shop?bogusOption=1: "),
    ("bad-port", "mongodb://alice9:S3crpw9@127.0.0.1:99999/shop", "mongodb://***@127.0.0.1:99999/shop: "),
    ("space-and-quotes", "mongodb://alice9:S3cr pw9'\"@127.0.0.1:99999/shop", "mongodb://***@127.0.0.1:99999/shop: "),
    ("no-scheme", "alice9:S3cr/pw9@127.0.0.1:{port}", "must begin with mongodb://"),
    ("other-scheme", "http://alice9:S3crpw9@127.0.0.1:{port}/", "must begin with mongodb://"),
    ("not-a-uri", "notamongouri", "must begin with mongodb://"),
]
CASES = [pytest.param(uri, says, id=case) for case, uri, says in HOSTILE]
# well formed (the password escaped), but nothing listens
UNREACHABLE = "mongodb://alice9:S3cr%2Fpw9@127.0.0.1:{port}/shop?serverSelectionTimeoutMS=100"


def assert_hidden(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret.lower() not in text.lower(), text
