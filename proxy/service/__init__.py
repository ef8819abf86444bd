"""The services that run a request over the core and the adapters: the composition, the planner,
the cache, the write-back, feedback and settling, the lifecycle. The HTTP edge, the CLI and the
offline tools are built over them."""
