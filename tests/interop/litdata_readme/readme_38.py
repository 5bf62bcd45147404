# ruff: noqa -- LitData README.md line 1131 (Lightning-AI/litdata@bef28be), as written; only the litdata import changed
from llm.data import Encryption

class CustomEncryption(Encryption):
    def encrypt(self, data):
        # Implement your custom encryption logic here
        return data

    def decrypt(self, data):
        # Implement your custom decryption logic here
        return data
