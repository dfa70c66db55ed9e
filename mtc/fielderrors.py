"""Bad input that names its fields: the one shape behind the spec, submit, launch,
recipe and deploy errors, which the API answers with a 400 naming each field."""


class FieldErrors(Exception):
    """``fields`` maps each bad field (a name or a JSON path) to a message."""

    def __init__(self, fields: dict[str, str]):
        self.fields = fields
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
