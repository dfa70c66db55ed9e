from .selectors import identity_mode


def identity(request) -> dict:
    """The mode for every page: single-user pages carry the "not isolated" banner."""
    mode = identity_mode()
    return {"identity_mode": mode, "identity_isolated": mode != "single-user"}
