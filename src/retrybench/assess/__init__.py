"""`retrybench assess`: which control keeps one deployment up, at its burst, with the largest burst each survives."""
