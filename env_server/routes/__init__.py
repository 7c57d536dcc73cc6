"""The service's routes, one module per protocol, each an `APIRouter` over `env_server.service.Service`:
`http` (OpenEnv's stateless HTTP routes, tasks, metrics), `sessions` (stateful HTTP), `mcp`
(MCP JSON-RPC) and `ws` (OpenEnv's WebSocket)."""
