"""The review web UI: FastAPI, server-rendered templates, token login, CSRF-checked POSTs."""

from infra_agent.review.web.app import ReviewServer, create_app, serve, server_for
from infra_agent.review.web.auth import ReviewerAuth
from infra_agent.review.web.guards import Address
from infra_agent.review.web.listener import bind

__all__ = ["Address", "ReviewServer", "ReviewerAuth", "bind", "create_app", "serve", "server_for"]
