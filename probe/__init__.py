"""gputop probe."""
