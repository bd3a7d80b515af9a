"""`localspec serve`: the OpenAI-compatible HTTP server (Starlette on uvicorn), with Ollama's API.

`app` holds the server (one generation at a time, a queue, prefix reuse, the k controllers per
temperature band); `api` parses and answers the OpenAI request and response objects (`errors` its
refusal, `messages` the chat messages, `prompt` a request's tokens); `tools` checks, offers and
forces tool calls, `calls` reads them out of replies; `ollama` is Ollama's API over the same
server; `http` is the plumbing (the API key, event streams, disconnects, running uvicorn);
`metrics` is /metrics; `loadtest` is the load test (`python -m localspec.serve.loadtest`).

May import the engine, the algorithm, the loading layer and saved chats. Must never import the
CLI, bench, doctor or the UI.
"""
