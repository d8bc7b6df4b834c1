"""The terminal chat UI (``localinfer chat``), built on Textual. Every module here but
``figures.py`` imports Textual; the model is reached only through ``localinfer.session``.

- ``app.py``: the app shell and its factory ``create_app``: composes the chat screen, the key
  bindings and the other screens; gets a model ready (the session) in a thread worker.
- ``conversation.py``: the chat screen's controller: send, stream the reply from a thread
  worker, cancel, save the chat, a full context.
- ``turns.py``: what else changes the conversation: regenerate (versions browsed with ←/→),
  edit the last message, summarise older turns, thinking on/off, attached files.
- ``reply.py``: the reply being streamed, the messages its worker posts, its final figures.
- ``status.py``: the status bar, and the machine figures behind its roofline (the bandwidth
  measured and measured again in thread workers).
- ``screens.py``: the other screens: models, chats, settings, help, dialogs.
- ``widgets.py``: the widgets that only render: message box, messages, transcript, loading.
- ``figures.py``: the speed figures in words and the sparkline's samples, without Textual.

The styles are in ``chat.tcss``.
"""
