"""What data is served: experience records, the buffer, prompt and demonstration sources."""
