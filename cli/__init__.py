"""The ``fusionrag`` command line: click commands that parse options and call the library."""
