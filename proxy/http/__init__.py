"""The aiohttp edge: app assembly, keys, routes, the chat handler, admin, middlewares."""
