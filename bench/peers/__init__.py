"""The peers: RQ, Celery and Dramatiq, measured like forq on the same Redis.

They run from their own venv (bench/.venv-peers, made by `venv.ensure`), never from
forq's: `driver.py` runs there and starts their workers there. forq's side only
talks to the driver through its command line and the JSON it prints.
"""
