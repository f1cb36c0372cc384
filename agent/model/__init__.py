"""The model client: one chat-completions transport, shaped per API dialect (openai, glm)."""
