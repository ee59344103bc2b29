"""The ``hami`` operator command: run the local stack, decode HAMi annotation values."""
