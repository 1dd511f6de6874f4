"""colibri-bench: the measurement tools (speed, memory, profile, conversion), apart from the user-facing app.

They print figures and write JSON; nothing here is imported by the chat window or the engine.
"""
