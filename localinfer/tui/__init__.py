"""The terminal chat UI (``localinfer chat``), built on Textual.

``app.py`` is the app and its factory ``create_app``; ``session.py`` reaches the model through
the daemon or an in-process engine; ``speed.py`` and ``models.py`` compute what the screens
show without importing Textual; the styles are in ``chat.tcss``.
"""
