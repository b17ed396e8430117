"""`bulkfetch bench` and what the benchmark scripts share.

    command.py   the Click command (imports only click until it runs)
    session.py   one session: export, nginx, the wrk ceiling, every row, the sweeps
    designs.py   the case study's designs, each runnable as `python -m bulkfetch.bench.designs`
    peers.py     rclone / aria2c / wget2 / curl command lines, URL lists, nginx autoindex
    ceiling.py   wrk's command line and output
    verify.py    file counts and sampled MD5s against the export
    rows.py      a row, its ratios and JSON record, the one-billion-files projection
    table.py     markdown tables;  plots.py: PNG charts (matplotlib, lazily)
    machine.py   machine.txt and the results directory's name;  output.py: what is written
    harness.py   pinning, servers, CPU and peak RSS of a process tree, settling the disk
"""
