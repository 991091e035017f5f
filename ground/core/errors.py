"""The one exception type that means "the user asked for something that cannot be done".

The command line turns it into a one-line message and a non-zero exit; anything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user: an unknown name, a path that is not a model, an impossible budget."""
