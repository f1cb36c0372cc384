"""The review web UI: FastAPI, server-rendered templates, token login, CSRF-checked POSTs."""

from infra_agent.review.web.app import ReviewServer, bind, create_app, serve, server_for
from infra_agent.review.web.auth import ReviewerAuth

__all__ = ["ReviewServer", "ReviewerAuth", "bind", "create_app", "serve", "server_for"]
