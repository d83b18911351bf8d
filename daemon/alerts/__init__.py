"""Which alerts go out, their words, and the channels they leave by."""
