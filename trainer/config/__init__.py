"""The trainer config: the typed frozen pydantic models and `load_config` (`schema`), and the
loading machinery they use (`loading`: YAML base files, dotted overrides, one-line errors).
The recipes themselves are YAML files in trainer/configs/.
"""
