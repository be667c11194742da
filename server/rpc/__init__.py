"""gRPC servicers only: method names are RPC names; they call the same services as the REST API."""
