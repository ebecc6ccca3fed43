"""Chat widgets: message list, markdown rendering, input box, history store."""
