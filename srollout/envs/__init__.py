"""Text environments: the TextEnv protocol, ALFWorld on the real engine, generated games, ReAct."""
