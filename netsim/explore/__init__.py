"""``netsim explore``: a full-screen terminal explorer of a run's trace (Textual).

``model`` holds the trace as indexed numpy columns, ``follow`` follows messages and explains round
timeouts, ``query`` parses filters and searches, ``export`` writes Chrome/Perfetto JSON, ``app`` is the
Textual application (the only module that imports textual).
"""
