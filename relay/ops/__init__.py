"""Operations at the edge of the loop: the observer the loop reports to, metrics, health
checks and their HTTP server, and logging."""
