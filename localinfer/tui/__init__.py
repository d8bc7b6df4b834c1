"""The terminal chat UI (``localinfer chat``), built on Textual.

``app.py`` is the app and its factory ``create_app``; it reaches the model, and asks what to
show about models, through the core's ``localinfer.session``; ``speed.py`` puts the figures
into words without importing Textual; the styles are in ``chat.tcss``.
"""
