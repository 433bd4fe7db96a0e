# Settings shared by every backbone base of this folder (one file per size inherits this one).
custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)
