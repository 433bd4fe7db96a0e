from .pola import pola_attention, pola_attention_reference

__all__ = ['pola_attention', 'pola_attention_reference']
