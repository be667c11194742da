"""Auth and tokens: API and join tokens, who may act on a job."""
