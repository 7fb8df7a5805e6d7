__version__ = "0.1.0"
USER_AGENT = f"hutch-sdk-python/{__version__}"
