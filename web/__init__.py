"""forq web: the operator's live dashboard (`forq web`), an optional extra.

    pip install 'forq[web]'
    forq web --listen 127.0.0.1:8080

Its own process, reading Redis as the CLI does; the supervisor never imports it.
"""
