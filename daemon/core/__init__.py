"""What both front ends and the bisect share: errors, atomic writes, units, redaction, git reads."""
