"""When things happen: regenerate experience, evaluate, write the summary."""
