"""The expiry command line: the commands (``main``), what each accepts
(``args``), how they print (``output``) and ``expiry demo`` (``demo``)."""
