"""Things people run that are not the library: ``posenc tour``, ``posenc plot``, ``posenc bench``."""
