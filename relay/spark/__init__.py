"""PySpark jobs over the relay's topics (materialize, audit)."""
