"""The pure core: the request model, identity, policy, text, the decision. Plain functions over
frozen values: no event loop, no model runtime, no IO (the import contract `pure-core`)."""
