"""`localspec chat`: a Textual terminal chat that shows speculative decoding working live.

Registered through the "localspec.commands" entry point, so the `localspec` package never imports
this one (and needs no Textual to run `generate` or `bench`).
"""
