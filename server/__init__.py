"""The mwms coordinator: REST API, gRPC agent service, scheduler and the SQL store behind them."""
