"""The node agent: a Celery worker with embedded beat on each GPU host. It needs the
broker only, never the database: what it learns goes to the central ingest queue."""
