"""HTTP routers only: parse the request, call a service, shape the response."""
