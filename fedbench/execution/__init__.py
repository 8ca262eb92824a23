"""HOW runs execute: the runner (one RunRecord per run), the cache, the scheduler and placement.

`runner` turns one `RunSpec` into one record (utility run, attack run, metrics); `cache` memoises the
utility and attack computations it is handed, each computed under its run's lock (`locks`: processes
sharing a cache compute a shared run once); `scheduler` runs a grid's runs in order on local processes or
Ray; `placement` validates devices, GPUs and backends; `sources` digests plugin code; `paths` owns the
cache folder; `provenance` says which versions and machine produced a result.
"""
