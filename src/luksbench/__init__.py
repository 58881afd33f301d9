"""luksbench: what does disk encryption cost on my hardware, and how sure are we?"""

__version__ = "0.1.0"
