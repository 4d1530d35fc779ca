"""The crash and fault harness (issue 6): ``python -m tests.stress [--quick] [flags]``, ``make stress``,
``make stress-quick``. How a run goes: ``tests/stress/harness.py``; the processes: ``writer.py`` and
``consumer.py``; what each number means: ``accounting.py``.

The report (JSON, the last line of stdout):

    written        pushes that returned (each writer logs it, one write(2) per ack, before anything else)
    processed      distinct messages some handler ran on
    lost           written and never processed                                     must be 0
    unexpected     processed but never pushed, corrupted, or stored twice           must be 0
    duplicated     messages whose handling *and* ack() completed more than once     with dedupe: must be 0
    duplicates_allowed   of those, how many the design explains: without dedupe, an ack that returned is
                   only in memory until the next state flush, so a consumer killed in between has the
                   message delivered again; with dedupe, 0 (a keyed ack is stored in the inbox first)
    redelivered_in_flight  messages handled again because the consumer that handled them first was killed
                   (or lost its lease) between the handler's side effect and ack() returning: allowed in
                   both modes, at most one batch per kill; the harness fails on any not explained so
    left_behind    buckets / messages / dead letters / quarantined after the drain  must be all 0
    unacked_pushes pushes of writers killed before push() returned: may be lost; counted apart
    faults, throughput (write, crash_recovery, drain, total), errors

The exit status is 1 when anything must-be-0 is not, or a process failed; else 0.
"""
