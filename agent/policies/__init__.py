"""Policies decide the agent's next move: `llm` (a model over an OpenAI-compatible API),
`search` (no model: knob search seeded by the skeletons), `scripted` (replays recorded replies;
test equipment, chosen only explicitly). A new policy is one module plus one line in `build`."""
