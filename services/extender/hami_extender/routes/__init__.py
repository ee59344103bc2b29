"""One router per endpoint group: the extender verbs and the probes."""
