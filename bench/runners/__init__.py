"""One module per contestant; each exposes scenario functions taking a spec dict and returning a result dict."""
