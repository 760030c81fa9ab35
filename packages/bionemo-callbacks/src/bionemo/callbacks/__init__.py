"""Lightning callbacks: perplexity logging and prediction writing."""
