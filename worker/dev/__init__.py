"""Development tooling (the embedded broker of the demo and tests); the worker never uses it."""
