"""The wire-protocol proxy: any client, in any language, as a pgrace session.

``wire`` (framing and message meaning), ``values`` (parameters and results as text) and ``steps``
(which messages make a step, when its answer is complete) are pure; ``startup`` and ``relay``
hold the sockets.
"""
