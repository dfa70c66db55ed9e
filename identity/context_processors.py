from .selectors import identity_mode, single_user_reason


def identity(request) -> dict:
    """The mode for every page: single-user pages carry the "not isolated" banner."""
    mode = identity_mode()
    isolated = mode != "single-user"
    return {
        "identity_mode": mode,
        "identity_isolated": isolated,
        "identity_reason": "" if isolated else single_user_reason(),
    }
