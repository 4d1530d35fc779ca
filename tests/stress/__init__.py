"""The crash and fault harness: ``python -m tests.stress [--quick] [flags]``, ``make stress``,
``make stress-quick``. How a run goes: ``tests/stress/harness.py``; the processes: ``writer.py`` and
``consumer.py``; what each number means: ``accounting.py``.

Without dedupe, messages are pushed without keys: nothing but the bucket protocol keeps a message from
coming twice, so a bucket stored again or an ack that was not kept shows as ``duplicated``.

The report (JSON, the last line of stdout):

    written        pushes that returned (each writer logs it, one write(2) per ack, before anything else)
    processed      distinct messages some handler ran on
    lost           written and never processed                                     must be 0
    unexpected     processed but never pushed, corrupted, or stored twice           must be 0
    duplicated     messages whose handling *and* ack() completed more than once, outside the documented
                   at-least-once windows                                          must be 0 (both modes)
    duplicates_explained  repeats inside those windows, counted apart: without dedupe, an ack that returned
                   is only in memory until the next state flush, so a consumer SIGKILLed in between, or
                   told its flush was refused (LeaseLost), has the message delivered again by a later claim
                   (more tries, after its lease ended); with dedupe, always 0 (a keyed ack is stored first)
    redelivered_in_flight  messages handled again because the consumer that handled them first was killed
                   (or lost its lease) between the handler's side effect and ack() returning: allowed in
                   both modes, at most one batch per kill; the harness fails on any not explained so
    left_behind    buckets / messages / dead letters / quarantined after the drain  must be all 0
    unacked_pushes pushes of writers killed before push() returned: may be lost; counted apart
    groups         ordered groups (a quarter of the seqs are pushed with group=, ``GROUPS`` groups per writer process):
                   groups, records, order_violations (a message first delivered before an earlier one of its
                   group; must be 0), overlaps (served before the previous message of its group was acked,
                   outside the window of a killed consumer or a lost lease; must be 0), redelivered (went back
                   in the group after a crash: allowed)
    faults         what was injected: consumer kills by kill point, writer kills, server restarts, proxy cuts;
                   lost_replies / lost_requests by target (bucket_insert, fenced_write), delayed_retries
                   (losses whose retry was held back past the lease: lost, held_back), command faults that
                   found no command (unfired), clock_steps_s (each consumer wall-clock step, in seconds)
    stream         the stream run after the queue's (``--no-streams`` skips it): two groups of one
                   stream, one with readers SIGKILLed at random, and a writer killed; lost, duplicated,
                   duplicates_explained, unexpected per group and in total (see ``streams.py``)
    modes          per dedupe mode run: ok, written, lost, duplicated, duplicates_explained, unexpected
    throughput (write, crash_recovery, drain, total), errors

The exit status is 1 when anything must-be-0 is not, or a process failed; else 0.
"""
