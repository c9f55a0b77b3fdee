"""A small Django app for the application-size benchmark (`bench/apps/real.py`): a
shop's models and their admin, as a real project's app would define them."""
