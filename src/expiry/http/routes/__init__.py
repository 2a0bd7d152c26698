"""The routes: one APIRouter of module-level functions per resource, mounted
by create_app in this order.

The API (JSON, in the OpenAPI schema): meta (health, metrics, discovery),
queue, cron, cleanup (trigger, policies, runs), dlq.
The dashboard (HTML, left out of the schema): dashboard (sign-in, static
files), pages (what it shows), steering (what it changes).

What a route needs (the App, the caller's key, the dashboard's pages) comes
from the dependencies in http/deps.py.
"""
