"""FusionRAG's algorithms: chunk entries (plain and fused), assembly, token selection."""
